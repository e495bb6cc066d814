"""Downloader engines: one module per downloader type."""
