"""Crafted conversation ids and handles the security tests send everywhere: separators,
braces, traversal, control and non-ASCII characters, over-long ids."""

CRAFTED = [
    "a:b",
    "{a}",
    "a}b",
    "{a:b}",
    "a/b",
    "..",
    "../b",
    "./a",
    ".hidden",
    "a\\b",
    "a b",
    "a\x00b",
    "é",
    "会话",
    "🙂",
    "x" * 129,
    "x" * 10_000,
    "*",
    "a?b",
]
