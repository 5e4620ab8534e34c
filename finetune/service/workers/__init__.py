"""The worker side: claim a job, plan it, start its trainer, watch it; the adapter to the training library."""
