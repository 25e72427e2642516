"""Interfaces of the replaceable ops. Plugins implement them; the CPU plugin's implementations
are the plain-torch references every device kernel is tested against."""
