"""The demo lab (``make demo``, ``make demo-cluster``): the acts that show the claim, apart
from the ``interference`` CLI that operators install. It may use every program's package;
no program imports it."""
