"""The write role: the consumer group (`consumer`) and its operator pipeline (`pipeline`)."""
