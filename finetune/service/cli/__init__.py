"""The service's command line: serve, worker, keys, audit, tenants, purge, usage."""
