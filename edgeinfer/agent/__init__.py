"""The device agent: pipelines run under supervision, telemetry, commands and model updates over MQTT."""
