"""The address forms the guard and the wall must see through (issue 38), and who may receive a
job's credentials."""
from __future__ import annotations

import ipaddress

import pytest

from common import netguard
from common.secrets import is_secret_header, keeps_credentials
from slave.download.engines import seccomp


@pytest.mark.parametrize("text, carried", [
    ("::ffff:10.1.2.3", "10.1.2.3"),                     # mapped
    ("::7f00:1", "127.0.0.1"),                           # IPv4-compatible
    ("64:ff9b::a9fe:a9fe", "169.254.169.254"),           # NAT64 (RFC 6052 /96)
    ("64:ff9b:1:c0a8:1:700::", "192.168.1.7"),           # local-use NAT64 (RFC 8215, /48 form)
    ("2002:a00:1::5", "10.0.0.1"),                       # 6to4
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1"),  # Teredo's client
])
def test_an_ipv6_address_carrying_ipv4_is_that_ipv4_address(text, carried):
    assert netguard.parse_ip(text) == ipaddress.ip_address(carried)


@pytest.mark.parametrize("text", ["::1", "::", "2606:4700::1111", "fe80::1%eth0"])
def test_other_ipv6_addresses_stay_themselves(text):
    assert netguard.parse_ip(text) == ipaddress.ip_address(text.split("%")[0])


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1"])
def test_numeric_hosts_in_any_resolver_form_are_addresses(host):
    assert netguard.literal_ip(host) == ipaddress.ip_address("127.0.0.1")


@pytest.mark.parametrize("host", ["example.com", "deadbeef", "cafe.de", "1e3.example", ""])
def test_names_are_not_addresses(host):
    assert netguard.literal_ip(host) is None


def test_embedding_networks_cover_exactly_the_carried_addresses():
    nets = netguard.embedding_networks(ipaddress.IPv4Network("10.0.0.0/8"))
    assert [str(n) for n in nets] == ["64:ff9b::a00:0/104", "64:ff9b:1:a00::/56", "::a00:0/104",
                                      "2002:a00::/24"]
    for inside in ("64:ff9b::a01:203", "64:ff9b:1:a01:2:300::", "::a01:203", "2002:a01:203::1"):
        assert any(ipaddress.ip_address(inside) in n for n in nets)
        assert netguard.parse_ip(inside) == ipaddress.ip_address("10.1.2.3")


@pytest.mark.parametrize("first, then, keeps", [
    ("https://a.example/x", "https://a.example/y", True),
    ("http://a.example/x", "https://a.example/y", True),     # an upgrade on the default ports
    ("https://a.example/x", "http://a.example/y", False),    # a downgrade
    ("https://a.example/x", "https://b.example/y", False),
    ("https://a.example/x", "https://sub.a.example/y", False),
    ("http://a.example:8080/x", "http://a.example:9090/y", False),
    ("http://A.example/x", "http://a.EXAMPLE/y", True),
])
def test_credentials_go_to_the_tasks_own_site_only(first, then, keeps):
    assert keeps_credentials(first, then) is keeps


def test_every_header_but_the_standard_ones_is_a_secret():
    assert is_secret_header("X-Api-Key") and is_secret_header("authorization") and is_secret_header("Cookie")
    assert not is_secret_header("Accept-Language") and not is_secret_header("User-Agent")


def test_the_seccomp_programs_are_whole_instructions():
    for unix in (False, True):
        program = seccomp.program("x86_64", unix=unix)
        assert len(program) % 8 == 0 and len(program) // 8 == 15
    assert seccomp.program("x86_64") != seccomp.program("x86_64", unix=True)
    with pytest.raises(RuntimeError):
        seccomp.program("sparc")
