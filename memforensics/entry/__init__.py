"""Entry points: compose sources and analysis into model objects for the commands; never print."""
