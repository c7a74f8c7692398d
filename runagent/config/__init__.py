"""config.yaml read into typed, frozen settings; every error names the key and value."""
