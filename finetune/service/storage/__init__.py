"""The service's storage: tables, the one data-access layer, keys, the audit trail's records, quotas, usage, deletion."""
