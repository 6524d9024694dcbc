from ringbench.cli.app import main

main()
