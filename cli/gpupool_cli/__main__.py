from gpupool_cli.main import main

main()
