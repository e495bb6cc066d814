"""What master and slave share: configuration, the error tree, the command line's root, the store
(the only code that touches MongoDB), the queues, exports' formats, notifications and guards."""
