"""The web's routes: /api/v1, the download center, signed files, /metrics, the console."""
