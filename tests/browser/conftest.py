"""Real-browser tests: run by `make test-browser`, kept out of `make test` (--ignore)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in a real browser "
                                       "(make test-browser)")
