"""Parts shared by two or more families."""
