"""One download: the engines and the etiquette around them (site slots, robots.txt, coalescing)."""
