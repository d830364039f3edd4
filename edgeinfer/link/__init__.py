"""The link to the fleet: the MQTT protocol, the on-disk spool and the MQTT client that drains it.

``protocol`` (topics, schemas) · ``spool`` (the persistent outbox) · ``settings`` (broker URL,
TLS, LinkSettings) · ``mqtt`` (MqttLink: the thread and the connection) · ``outbox`` (the spool
drain and poison messages) · ``retained`` (the state birth) · ``paho_client`` (the paho calls).
"""
