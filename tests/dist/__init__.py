"""Multi-process tests on real gloo workers (loopback), one reusable worker pool per module."""
