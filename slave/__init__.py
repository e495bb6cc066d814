"""The slave: the worker (rq's view of it, running queue entries, storing what they produced),
one download (engines and etiquette), and export attempts."""
