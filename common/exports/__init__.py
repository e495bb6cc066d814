"""What exports are made of, shared by master and slave: templates, sheets, CSV/JSON Lines, events."""
