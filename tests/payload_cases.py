"""Payload values whose reading by Spark was recorded here, shared by the unit tier (the
Arrow form's rules against them) and the spark tier (both forms against Spark itself)."""

# What Spark 4.2's from_json gave for a DECIMAL(5,2) field (a session here, 2026-11-29): a
# JSON number as written, a string as Java's BigDecimal reads it (commas dropped), half up.
SPARK_DECIMAL_5_2 = {
    "1": "1.00",
    "1.005": "1.01",
    "1.004": "1.00",
    "-1.005": "-1.01",
    "-0.004": "0.00",
    "999.994": "999.99",
    "999.995": None,  # 1000.00: six digits
    "1e2": "100.00",
    "1E-3": "0.00",
    "1e-400": "0.00",
    "1e400": None,
    "12345678901234567890": None,
    '"12.345"': "12.35",
    '"+.5"': "0.50",
    '"5."': "5.00",
    '"1e2"': "100.00",
    '"-.005"': "-0.01",
    '"1,0.5"': "10.50",
    '",5"': "5.00",
    '"\u0661"': "1.00",  # an Arabic-Indic digit: Character.isDigit
    '","': None,
    '" 12"': None,
    '"12 "': None,
    '"NaN"': None,
    '"Infinity"': None,
    '"1_0"': None,
    '""': None,
    '"0x10"': None,
    '"1d"': None,
    '".e1"': None,
    '"1e"': None,
    '"--1"': None,
    '"1.2.3"': None,
    '"1e99999999999"': None,
    "true": None,
    "[1]": None,
    '{"a": 1}': None,
}
