"""Write contracts/payload_hash_vectors.json: payloads, their RFC 8785 bytes and hashes.

The test vectors every implementation of our payload hash reads (Python's in
tests/events/test_payload_hash_vectors.py; TypeScript's later). The expected canonical bytes
come from outside our code wherever they can:

* ``cyberphone``: the test data of the RFC author's reference implementations
  (github.com/cyberphone/json-canonicalization, testdata/input and testdata/outhex, Apache
  2.0), input text and expected bytes as published there.
* ``rfc8785-appendix-b``: the number serialisations of RFC 8785 Appendix B (IEEE 754 bits
  -> expected text), each as a one-element array.
* ``ledger``: the cases issue 28 names (1.0, 1e21, -0.0, 5e-324, key order where UTF-16
  and code points differ, nesting); their bytes were checked against that repository's
  ``node-es6/canonicalize.js`` under Node 20 when this file was written.

Every expected value is also checked against the rfc8785 package here, so the file
cannot be written with a case where our library and the published answer differ.

    .venv/bin/python scripts/payload_hash_vectors.py
"""

# ruff: noqa: E501 - the published test data below is kept verbatim, one string a case

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

import rfc8785

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from events.payload_hashes import LEGACY, hash_under, jcs_refusal  # noqa: E402

OUT = ROOT / "contracts" / "payload_hash_vectors.json"

# (name, input JSON text, expected canonical bytes as hex), as published.
CYBERPHONE = [
    (
        "arrays",
        '[\n  56,\n  {\n    "d": true,\n    "10": null,\n    "1": [ ]\n  }\n]\n',
        "5b35362c7b2231223a5b5d2c223130223a6e756c6c2c2264223a747275657d5d",
    ),
    (
        "french",
        '{\n  "peach": "This sorting order",\n  "p\u00e9ch\u00e9": "is wrong according to French",\n  "p\u00eache": "but canonicalization MUST",\n  "sin":   "ignore locale"\n}\n',
        "7b227065616368223a225468697320736f7274696e67206f72646572222c2270c3a96368c3a9223a2269732077726f6e67206163636f7264696e6720746f204672656e6368222c2270c3aa636865223a226275742063616e6f6e6963616c697a6174696f6e204d555354222c2273696e223a2269676e6f7265206c6f63616c65227d",
    ),
    (
        "structures",
        '{\n  "1": {"f": {"f": "hi","F": 5} ,"\\n": 56.0},\n  "10": { },\n  "": "empty",\n  "a": { },\n  "111": [ {"e": "yes","E": "no" } ],\n  "A": { }\n}',
        "7b22223a22656d707479222c2231223a7b225c6e223a35362c2266223a7b2246223a352c2266223a226869227d7d2c223130223a7b7d2c22313131223a5b7b2245223a226e6f222c2265223a22796573227d5d2c2241223a7b7d2c2261223a7b7d7d",
    ),
    (
        "unicode",
        '{\n  "Unnormalized Unicode":"A\\u030a"\n}\n',
        "7b22556e6e6f726d616c697a656420556e69636f6465223a2241cc8a227d",
    ),
    (
        "values",
        '{\n  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],\n  "string": "\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/",\n  "literals": [null, true, false]\n}',
        "7b226c69746572616c73223a5b6e756c6c2c747275652c66616c73655d2c226e756d62657273223a5b3333333333333333332e333333333333332c31652b33302c342e352c302e3030322c31652d32375d2c22737472696e67223a22e282ac245c75303030665c6e4127425c225c5c5c5c5c222f227d",
    ),
    (
        "weird",
        '{\n  "\\u20ac": "Euro Sign",\n  "\\r": "Carriage Return",\n  "\\u000a": "Newline",\n  "1": "One",\n  "\\u0080": "Control\\u007f",\n  "\\ud83d\\ude02": "Smiley",\n  "\\u00f6": "Latin Small Letter O With Diaeresis",\n  "\\ufb33": "Hebrew Letter Dalet With Dagesh",\n  "</script>": "Browser Challenge"\n}\n',
        "7b225c6e223a224e65776c696e65222c225c72223a2243617272696167652052657475726e222c2231223a224f6e65222c223c2f7363726970743e223a2242726f77736572204368616c6c656e6765222c22c280223a22436f6e74726f6c7f222c22c3b6223a224c6174696e20536d616c6c204c6574746572204f205769746820446961657265736973222c22e282ac223a224575726f205369676e222c22f09f9882223a22536d696c6579222c22efacb3223a22486562726577204c65747465722044616c6574205769746820446167657368227d",
    ),
]

# RFC 8785 Appendix B: IEEE 754 double (hex bits) -> its JCS text. NaN and Infinity
# (0x7fffffffffffffff, 0x7ff0000000000000) have none: see REFUSED.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]

# (name, input JSON text, expected canonical text): the cases the issue names.
LEDGER = [
    ("float-one", '{"amount": 1.0}', '{"amount":1}'),
    ("float-1e21", '{"big": 1e21, "below": 1e20}', '{"below":100000000000000000000,"big":1e+21}'),
    ("negative-zero", '{"z": -0.0}', '{"z":0}'),
    ("smallest-subnormal", "[5e-324, -5e-324]", "[5e-324,-5e-324]"),
    ("small-decimals", "[1e-7, 0.000001, 0.1, 1.5e-10]", "[1e-7,0.000001,0.1,1.5e-10]"),
    (
        "integers-at-the-safe-limit",
        "[9007199254740991, -9007199254740991, 0, -1]",
        "[9007199254740991,-9007199254740991,0,-1]",
    ),
    (
        # U+FB01 sorts before U+1F600 by code point, after it by UTF-16 unit (0xD83D).
        "key-order-utf16-not-code-points",
        '{"\\ufb01": "ligature", "\\ud83d\\ude00": "astral", "z": 1, "\\u00e9": 2}',
        '{"z":1,"\u00e9":2,"\U0001f600":"astral","\ufb01":"ligature"}',
    ),
    (
        "astral-values",
        '{"emoji": "\\ud83d\\ude02 \\ud834\\udd1e", "cjk": "\\u6f22"}',
        '{"cjk":"\u6f22","emoji":"\U0001f602 \U0001d11e"}',
    ),
    (
        "escapes",
        '{"s": "tab\\t nl\\n quote\\" back\\\\ ctrl\\u001f del\\u007f sep\\u2028 slash/"}',
        '{"s":"tab\\t nl\\n quote\\" back\\\\ ctrl\\u001f del\x7f sep\u2028 slash/"}',
    ),
    (
        "nested",
        '{"b": [[], [{}], {"y": [1, [2.50, [3e0]]], "x": null}], "a": {"d": true, "c": false}}',
        '{"a":{"c":false,"d":true},"b":[[],[{}],{"x":null,"y":[1,[2.5,[3]]]}]}',
    ),
    ("empty-object", "{}", "{}"),
    ("string-payload", '"report ready"', '"report ready"'),
]

# Input JSON text our publisher refuses to hash, and why. NaN and Infinity are no JSON
# text at all (the publisher is given them only by a program, never as JSON): they are
# refused the same way, see tests/events/test_payload_hashes.py.
REFUSED = [
    (
        "integer-beyond-2^53",
        '{"id": 9007199254740993}',
        "payload.id",
        "an integer literal beyond 2**53 - 1 has no exact IEEE 754 double: refuse it (a "
        "JSON.parse rounds it silently; check the literal, or Number.isSafeInteger of an "
        "integer-valued number written without a fraction or exponent)",
    ),
    ("lone-surrogate", '{"s": "\\ud800"}', "payload.s", "a lone surrogate has no UTF-8 form"),
]


def _vector(name: str, source: str, text: str, canonical: bytes) -> dict[str, Any]:
    payload = json.loads(text)
    ours = rfc8785.dumps(payload)
    if ours != canonical:
        raise SystemExit(f"{name}: rfc8785 gives {ours!r}, the published answer {canonical!r}")
    return {
        "name": name,
        "source": source,
        "json": text,
        "canonical": canonical.decode("utf-8"),
        "canonical_hex": canonical.hex(),
        "payload_hash": "jcs-sha256:" + hashlib.sha256(canonical).hexdigest(),
        "legacy_payload_hash": hash_under(LEGACY, payload),
    }


def vectors() -> dict[str, Any]:
    """The file's content."""
    found = [
        _vector(name, "cyberphone", text, bytes.fromhex(hexed)) for name, text, hexed in CYBERPHONE
    ]
    for bits, expected in APPENDIX_B:
        number = struct.unpack(">d", bytes.fromhex(bits))[0]
        text = f"[{number!r}]"
        found.append(_vector(f"ieee-{bits}", "rfc8785-appendix-b", text, f"[{expected}]".encode()))
    found += [_vector(name, "ledger", text, out.encode()) for name, text, out in LEDGER]
    refused = []
    for name, text, field, why in REFUSED:
        reason = jcs_refusal(json.loads(text))
        if reason is None or not reason.startswith(field):
            raise SystemExit(f"{name}: expected a refusal naming {field}, got {reason!r}")
        refused.append({"name": name, "json": text, "field": field, "why": why})
    return {
        "description": (
            "Payload hashes of delivery-ledger (README: Payload hashes): payload_hash is "
            "'jcs-sha256:' + lowercase hex sha256 of the RFC 8785 canonical JSON of the "
            "payload parsed from 'json'; canonical_hex is those bytes. legacy_payload_hash "
            "is the unprefixed hash of records written before (sorted-key json.dumps), for "
            "readers of old records. 'refused' holds payloads a publisher must refuse, "
            "naming the field. Written by scripts/payload_hash_vectors.py."
        ),
        "sources": {
            "cyberphone": "github.com/cyberphone/json-canonicalization testdata (Apache-2.0)",
            "rfc8785-appendix-b": "RFC 8785 Appendix B, number serialisation samples",
            "ledger": "issue 28's cases, checked against cyberphone node-es6/canonicalize.js",
        },
        "vectors": found,
        "refused": refused,
    }


def main() -> int:
    """Write the file; fail when rfc8785 disagrees with a published answer."""
    content = vectors()
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(content, indent=2, ensure_ascii=True) + "\n")
    print(
        f"{OUT.relative_to(ROOT)}: {len(content['vectors'])} vectors, "
        f"{len(content['refused'])} refused"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
