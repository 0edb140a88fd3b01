"""Store: content-addressed objects (packs on disk, or rows in the database) and the Merkle
trees built of them; an object is durable before anything that references it is committed.
May import: kernel, workspace, metadata."""
