"""Framework adapters, one framework per module (ROLL, verl, TRL, ms-swift, Ray).

Each module imports its framework at first use and fails with the pip extra to install.
"""
