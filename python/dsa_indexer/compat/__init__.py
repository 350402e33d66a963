"""Drop-in replacements for the APIs serving engines call today."""
