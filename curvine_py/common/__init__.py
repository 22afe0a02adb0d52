"""Code shared by every process: config, errors, hash ring, data-channel frames, buffers."""
