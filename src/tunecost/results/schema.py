"""The version of the record files tunecost writes: `schema_version` of every row and of meta.json."""

SCHEMA_VERSION = 1
