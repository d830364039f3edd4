"""The fleet manager: ingest over MQTT, storage, deployments, artifact server, HTTP API."""
