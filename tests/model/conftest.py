import pytest


@pytest.fixture(scope="session")
def host():
    from infer.core.plugins import get_plugin_host

    return get_plugin_host()


@pytest.fixture(scope="session")
def cpu(host):
    return host.select("cpu")
