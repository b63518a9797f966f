pytest_plugins = ["tests.fixtures.broker"]
