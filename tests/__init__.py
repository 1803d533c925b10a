"""The test suite: a package so that its modules import `tests.helpers` (pytest puts the
repository root first on `sys.path`) and test files in different folders may share a name."""
