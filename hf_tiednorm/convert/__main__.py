from ..conversion.convert import main

main()
