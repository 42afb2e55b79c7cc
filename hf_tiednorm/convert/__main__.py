from ..bridges.convert import main

main()
