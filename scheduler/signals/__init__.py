"""The agents' signals as columns and the node table the plugins vectorise over."""
