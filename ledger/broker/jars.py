"""Provision Apache Kafka's jars from Maven Central with ``mvn``, once, into the cache."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from events.errors import LedgerError

LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "1.7.36"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

# Jars a broker cannot start without; a cache missing any of them is incomplete.
REQUIRED_PREFIXES = (
    "kafka_2.13-",
    "kafka-server-",
    "kafka-storage-",
    "kafka-clients-",
    "argparse4j-",
    "log4j-core-",
    "log4j-slf4j-impl-",
    "jackson-databind-",
    "scala-library-",
)

POM_TEMPLATE = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>delivery-ledger.local</groupId>
  <artifactId>kafka-broker-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-api</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def jars_dir(cache_dir: Path, kafka_version: str) -> Path:
    """Where the jars of one Kafka version live in the cache."""
    return cache_dir / f"kafka-{kafka_version}" / "libs"


def missing_jars(libs: Path) -> list[str]:
    """The required jar prefixes that ``libs`` lacks (empty when the cache is complete)."""
    if not libs.is_dir():
        return list(REQUIRED_PREFIXES)
    names = [p.name for p in libs.glob("*.jar")]
    missing = [pre for pre in REQUIRED_PREFIXES if not any(n.startswith(pre) for n in names)]
    if sum(1 for n in names if n.startswith("jackson-databind-")) > 1:
        missing.append("a single jackson-databind")
    return missing


def ensure_jars(cache_dir: Path, kafka_version: str) -> tuple[Path, bool]:
    """Return the jar directory, downloading with ``mvn`` only if the cache is incomplete.

    The second value says whether anything was downloaded.
    """
    libs = jars_dir(cache_dir, kafka_version)
    if not missing_jars(libs):
        return libs, False
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LedgerError(
            "Maven (mvn) is not installed, and the Kafka jars are not cached yet",
            "install Maven (apt-get install maven), or run Kafka with 'docker compose up'",
        )
    staging = Path(tempfile.mkdtemp(prefix="kafka-jars-", dir=_ensure(libs.parent.parent)))
    try:
        (staging / "pom.xml").write_text(
            POM_TEMPLATE.format(kafka=kafka_version, slf4j=SLF4J_VERSION, log4j=LOG4J_VERSION)
        )
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                "-DoutputDirectory=libs",
                "-DincludeScope=runtime",
            ],
            cwd=staging,
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
        if result.returncode != 0:
            last = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["(no output)"]
            raise LedgerError(
                f"mvn could not fetch Apache Kafka {kafka_version}: {last[0][:300]}",
                "check the network to Maven Central and LEDGER_KAFKA_VERSION",
            )
        gaps = missing_jars(staging / "libs")
        if gaps:
            raise LedgerError(
                f"mvn finished but jars are missing: {', '.join(gaps)}",
                "report this; the Kafka artifact layout may have changed",
            )
        if libs.exists():
            shutil.rmtree(libs)
        libs.parent.mkdir(parents=True, exist_ok=True)
        (staging / "libs").rename(libs)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return libs, True


def _ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
