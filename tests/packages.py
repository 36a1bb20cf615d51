"""The project's Python packages, as the checks over every package read them."""

PACKAGES = (
    "interference",
    "interference_infra",
    "node_agent",
    "scheduler",
    "interference_cli",
    "interference_demo",
    "credential_issuer",
)
