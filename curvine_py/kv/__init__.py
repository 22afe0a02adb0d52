"""KV-cache integrations over the SDK: LMCache's L2 adapter and remote storage plugin
(curvine_py/kv/lmcache.py), loaded by LMCache itself (docs/kvcache.md)."""
