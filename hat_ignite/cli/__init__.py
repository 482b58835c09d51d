"""Command-line entry points: ``hat-train`` and ``hat-predict``.

The only part of hat-ignite that reads ``sys.argv``, configures logging, seeds the random
generators or installs signal handlers. Importing this package does none of that; ``main()`` does.
"""
