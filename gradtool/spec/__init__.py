"""YAML op specs: line-numbered loading, validation, values, safe expressions, surrogates."""
