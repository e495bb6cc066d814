"""``downcluster web``: the app and its guards, the one error shape, the API's contract, the routes."""
