"""Provision Apache Kafka's jars from Maven Central with ``mvn``, once, into the cache."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from events.errors import LedgerError

LOG4J_VERSION = "2.25.5"
SLF4J_VERSION = "1.7.36"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"


@dataclass(frozen=True)
class Pin:
    """A transitive dependency of the broker held at a version without known advisories."""

    group: str
    artifact: str
    version: str
    # How the POM applies it: "managed" (dependencyManagement: wins wherever the artifact
    # appears in the tree), "direct" (new coordinates, the old ones excluded), "bom" (the
    # jackson-bom import), "declared" (a dependency this POM names itself: logging).
    source: Literal["managed", "direct", "bom", "declared"]
    why: str

    @property
    def jar(self) -> str:
        """The file name copy-dependencies gives it."""
        return f"{self.artifact}-{self.version}.jar"


# Kafka 4.1.1's POMs name versions with published advisories; Kafka's own builds force newer
# ones (its Gradle constraints do not reach the published POMs), so this fetch forces them
# too. Each was run with the broker tests and a delivery test (tests/ledger/test_jars.py).
JACKSON_VERSION = "2.22.4"  # jackson-bom: core, databind, annotations, csv, yaml, jdk8 as one
PINS = (
    Pin(
        "at.yawk.lz4",
        "lz4-java",
        "1.11.4",
        "direct",
        "org.lz4:lz4-java 1.8.0 (unmaintained): CVE-2025-12183 out-of-bounds access, "
        "CVE-2025-66566 buffer leak; the fork's 1.11.2 fixes those and CVE-2026-59949, "
        "GHSA-6cx8-rjf8-pr8g, GHSA-4v53-57pg-c464 (Kafka itself moved to 1.11.2)",
    ),
    Pin(
        "commons-beanutils",
        "commons-beanutils",
        "1.11.0",
        "managed",
        "1.9.4 via commons-validator: CVE-2025-48734 (declaredClass access; KAFKA-19359)",
    ),
    Pin(
        "com.github.luben",
        "zstd-jni",
        "1.5.7-28",
        "managed",
        "1.5.6-10: GHSA-mwq5-v3w5-qr6v, GHSA-v36p-vv44-8qfg, GHSA-392q-wrgq-6wmj "
        "(fixed in 1.5.7-14 / after 1.5.7-13)",
    ),
    Pin(
        "org.xerial.snappy",
        "snappy-java",
        "1.1.10.12",
        "managed",
        "1.1.10.7: the out-of-bounds write in compress reported for <= 1.1.10.8 "
        "(snappy-java #732); the newest 1.1.10.x",
    ),
    Pin(
        "com.fasterxml.jackson.core",
        "jackson-core",
        JACKSON_VERSION,
        "bom",
        "2.19.0: GHSA-72hv-8253-57qq and its incomplete fix GHSA-r7wm-3cxj-wff9 "
        "(async parser number length; fixed in 2.22.1)",
    ),
    Pin(
        "org.apache.logging.log4j",
        "log4j-core",
        LOG4J_VERSION,
        "declared",
        "2.24.3: CVE-2025-68161 (2.25.3), CVE-2026-34477..34481 (2.25.4), "
        "CVE-2026-49844 (log4j-api, 2.25.5)",
    ),
)
# Pulled in by kafka-clients under the old coordinates; replaced by the fork above.
EXCLUDED = (("org.lz4", "lz4-java"),)

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
  <dependencyManagement>
    <dependencies>
      <dependency><groupId>com.fasterxml.jackson</groupId><artifactId>jackson-bom</artifactId>
        <version>{jackson}</version><type>pom</type><scope>import</scope></dependency>
{managed}
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
      <exclusions>
{exclusions}
      </exclusions></dependency>
{direct}
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


def _dependency(group: str, artifact: str, version: str) -> str:
    return (
        f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
    )


def pom(kafka_version: str) -> str:
    """The throwaway POM whose runtime dependencies are the broker's jars, pins applied."""
    return POM_TEMPLATE.format(
        kafka=kafka_version,
        slf4j=SLF4J_VERSION,
        log4j=LOG4J_VERSION,
        jackson=JACKSON_VERSION,
        managed="\n".join(
            "  " + _dependency(p.group, p.artifact, p.version)
            for p in PINS
            if p.source == "managed"
        ),
        direct="\n".join(
            _dependency(p.group, p.artifact, p.version) for p in PINS if p.source == "direct"
        ),
        exclusions="\n".join(
            f"        <exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId></exclusion>"
            for g, a in EXCLUDED
        ),
    )


def jars_dir(cache_dir: Path, kafka_version: str) -> Path:
    """Where the jars of one Kafka version and one set of pins live in the cache.

    The directory is named for the POM's digest, so a change of pins fetches anew beside
    the old set instead of replacing jars that a running broker of another checkout uses.
    """
    digest = hashlib.sha256(pom(kafka_version).encode()).hexdigest()[:12]
    return cache_dir / f"kafka-{kafka_version}-{digest}" / "libs"


def missing_jars(libs: Path) -> list[str]:
    """What ``libs`` lacks (empty when the cache is complete and holds the pinned versions)."""
    if not libs.is_dir():
        return list(REQUIRED_PREFIXES)
    names = [p.name for p in libs.glob("*.jar")]
    missing = [pre for pre in REQUIRED_PREFIXES if not any(n.startswith(pre) for n in names)]
    if sum(1 for n in names if n.startswith("jackson-databind-")) > 1:
        missing.append("a single jackson-databind")
    for pin in PINS:
        others = [
            n
            for n in names
            if n != pin.jar and re.fullmatch(rf"{re.escape(pin.artifact)}-\d.*\.jar", n)
        ]
        if pin.jar not in names or others:
            found = f" (found {', '.join(sorted(others))})" if others else ""
            missing.append(f"{pin.jar}{found}")
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
        (staging / "pom.xml").write_text(pom(kafka_version))
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                # A jar whose checksum does not match the repository's fails the fetch.
                "--strict-checksums",
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
                "check the network to Maven Central and LEDGER_KAFKA__VERSION",
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
