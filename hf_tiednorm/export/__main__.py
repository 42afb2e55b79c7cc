from ..bridges.export import main

main()
