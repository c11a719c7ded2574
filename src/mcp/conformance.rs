//! Fixture tools, resources and prompts of the official MCP conformance suite (feature `conformance`).
