from ..conversion.export import main

main()
