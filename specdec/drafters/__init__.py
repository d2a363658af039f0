"""Drafters propose draft tokens; each is one small class behind the Drafter protocol."""
