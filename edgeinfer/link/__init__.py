"""The link to the fleet: the MQTT protocol, the on-disk spool and the MQTT client that drains it."""
