"""The store: the only code that names a MongoDB collection or its fields."""
