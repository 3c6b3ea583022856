"""A vLLM general plugin for tern's engine tests only. vLLM's CPU build has
no NVFP4 kernel; this lets its NVFP4 loaders (ModelOpt and
compressed-tensors) load tern's files on a CPU-only machine by running
vLLM's own software emulation:

* W4A4 (ModelOpt "NVFP4", activations quantized too): vLLM's
  EmulationNvFp4LinearKernel, registered for the CPU platform.
* W4A16 (compressed-tensors nvfp4-pack-quantized without input activations):
  vLLM forces Marlin there, which needs CUDA; W4A16Emulation below
  dequantizes the weight with vLLM's own dequantize_to_dtype and multiplies.

Loading, name mapping, fusing q/k/v and gate/up and the scale processing
stay vLLM's. Found through the dist-info next to it (entry point group
vllm.general_plugins) when this folder is on sys.path / PYTHONPATH.
"""


def register():
    import torch

    import vllm.model_executor.kernels.linear as linear
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import (
        dequantize_to_dtype,
    )
    from vllm.platforms import PlatformEnum, current_platform

    if not current_platform.is_cpu() or getattr(linear, "_tern_test_plugin", False):
        return  # vLLM may load plugins more than once per process
    linear._tern_test_plugin = True
    linear.register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")

    class W4A16Emulation(EmulationNvFp4LinearKernel):
        def apply_weights(self, layer, x, bias=None):
            w = dequantize_to_dtype(layer.weight.data.view(torch.uint8), layer.weight_scale.data,
                                    layer.weight_global_scale, x.dtype, 16, swizzle=False)
            out = torch.matmul(x, w.t())
            return out if bias is None else out + bias

    original = linear.init_nvfp4_linear_kernel

    def init_nvfp4_linear_kernel(use_a16=False):
        if use_a16:
            return W4A16Emulation(linear.NvFp4LinearLayerConfig())
        return original(use_a16=use_a16)

    # The loaders import the function by name.
    import vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w4a4_nvfp4 as ct
    import vllm.model_executor.layers.quantization.modelopt as modelopt
    for module in (linear, ct, modelopt):
        module.init_nvfp4_linear_kernel = init_nvfp4_linear_kernel
