"""The download center: export requests, their recovery, and the CLI dump."""
