{
  description = "Python environment for rsim's GPU recipes (torch, transformers, peft), pinned by flake.lock";
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.05";
  outputs = { self, nixpkgs }:
    let
      system = "x86_64-linux";
      pkgs = import nixpkgs { inherit system; config.allowUnfree = true; config.cudaSupport = true; };
      python = pkgs.python3.withPackages (ps: [ ps.torch ps.transformers ps.peft ps.safetensors ]);
    in {
      devShells.${system}.default = pkgs.mkShell { packages = [ python ]; };
    };
}
