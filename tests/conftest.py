pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.secure_broker",
    "tests.fixtures.postgres",
    "tests.fixtures.receiver",
    "tests.fixtures.worker",
    "tests.fixtures.projection",
    "tests.fixtures.core",
]
