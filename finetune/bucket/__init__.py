"""Where a run's files live: a local folder, or an S3-compatible bucket (`s3://bucket/prefix`), by one URI.

    uri.py        what a location string is (is_remote, join, the bucket and key), and what is refused
    settings.py   the endpoint, region, credentials and checksums of a bucket: as every AWS client reads them, or
                  from the storage config ($FINETUNE_STORAGE_CONFIG)
    client.py     the filesystem object (fsspec + s3fs) of a bucket, and one clear error naming the node and the URI
    remote.py     Remote: the operations on one prefix (list, read, write, put and get files, remove), and folders
                  committed by a manifest written last
    inputs.py     a URI's node-local copy (a data file, a base model), kept in the cache and checked

A local path is never sent here: callers test `is_remote(location)` and keep their path code as it is.
"""
