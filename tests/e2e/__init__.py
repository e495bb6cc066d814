"""Tests of the whole cluster with real worker processes: faults injected into them, hosts in
network namespaces, browsers, Redis failover, the README's commands and the benchmark's smoke run."""
