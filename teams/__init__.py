"""Teams, their members and the users' API tokens. Imports none of the domain apps."""
