# torchrun_train.py is a script that test_launch.py hands to torchrun, not a test module:
# importing it (as --doctest-modules would) runs it without its command-line arguments.
collect_ignore = ["torchrun_train.py"]
