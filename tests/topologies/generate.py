#!/usr/bin/env python3
"""Writes the hwloc XML topologies the workspace tests replay (maintainer tool; the
XML is committed). Each machine: packages with one NUMA node each, cores, and PCI
devices under their package: NVIDIA GPUs (PCI class 0302, with a cudaN OS device),
NICs (an OpenFabrics mlx5_N and a network device), and an "NVLinkBandwidth"
distances matrix over the GPUs, as hwloc's NVML backend reports NVLink."""
import sys

class Gen:
    def __init__(self):
        self.gp = 0
    def next(self):
        self.gp += 1
        return self.gp

def mask(bits):
    v = 0
    for b in bits:
        v |= 1 << b
    return "0x%08x" % v if v < 2**32 else "0x" + format(v, "x")

def machine(packages, cores_per_pkg, mem_gib, gpus, nics, nvlink):
    """gpus / nics: lists of package indexes (one entry per device);
    nvlink: set of frozenset({i, j}) GPU pairs joined by NVLink (18 links each)."""
    g = Gen()
    ncpu = packages * cores_per_pkg
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<!DOCTYPE topology SYSTEM "hwloc2.dtd">',
           '<topology version="2.0">']
    allcpu, allnode = mask(range(ncpu)), mask(range(packages))
    out.append('  <object type="Machine" os_index="0" cpuset="%s" complete_cpuset="%s" allowed_cpuset="%s" '
               'nodeset="%s" complete_nodeset="%s" allowed_nodeset="%s" gp_index="%d">'
               % (allcpu, allcpu, allcpu, allnode, allnode, allnode, g.next()))
    gpu_gp = {}
    bus = 0x18
    for p in range(packages):
        cpus = mask(range(p * cores_per_pkg, (p + 1) * cores_per_pkg))
        node = mask([p])
        out.append('    <object type="Package" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" '
                   'complete_nodeset="%s" gp_index="%d">' % (p, cpus, cpus, node, node, g.next()))
        out.append('      <object type="NUMANode" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" '
                   'complete_nodeset="%s" gp_index="%d" local_memory="%d"/>'
                   % (p, cpus, cpus, node, node, g.next(), mem_gib << 30))
        for c in range(p * cores_per_pkg, (p + 1) * cores_per_pkg):
            cm = mask([c])
            out.append('      <object type="Core" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" '
                       'complete_nodeset="%s" gp_index="%d">' % (c, cm, cm, node, node, g.next()))
            out.append('        <object type="PU" os_index="%d" cpuset="%s" complete_cpuset="%s" nodeset="%s" '
                       'complete_nodeset="%s" gp_index="%d"/>' % (c, cm, cm, node, node, g.next()))
            out.append('      </object>')
        devs = [("gpu", i) for i, pk in enumerate(gpus) if pk == p] + [("nic", i) for i, pk in enumerate(nics) if pk == p]
        if devs:
            out.append('      <object type="Bridge" gp_index="%d" bridge_type="0-1" depth="0" bridge_pci="0000:[%02x-%02x]">'
                       % (g.next(), bus, bus + len(devs)))
            for kind, i in devs:
                bus += 1
                if kind == "gpu":
                    out.append('        <object type="PCIDev" gp_index="%d" pci_busid="0000:%02x:00.0" '
                               'pci_type="0302 [10de:2335] [10de:18be] a1" pci_link_speed="0.000000">' % (g.next(), bus))
                    gpu_gp[i] = g.next()
                    out.append('          <object type="OSDev" gp_index="%d" name="cuda%d" subtype="CUDA" osdev_type="5">'
                               % (gpu_gp[i], i))
                    out.append('            <info name="Backend" value="CUDA"/>')
                    out.append('            <info name="GPUModel" value="NVIDIA H200"/>')
                    out.append('          </object>')
                else:
                    out.append('        <object type="PCIDev" gp_index="%d" pci_busid="0000:%02x:00.0" '
                               'pci_type="0207 [15b3:1021] [15b3:0041] 00" pci_link_speed="0.000000">' % (g.next(), bus))
                    out.append('          <object type="OSDev" gp_index="%d" name="mlx5_%d" osdev_type="3"/>' % (g.next(), i))
                    out.append('          <object type="OSDev" gp_index="%d" name="ib%d" osdev_type="2"/>' % (g.next(), i))
                out.append('        </object>')
            out.append('      </object>')
        out.append('    </object>')
    out.append('  </object>')
    if gpus and nvlink:
        n = len(gpus)
        idx = "".join("%d " % gpu_gp[i] for i in range(n))
        vals = "".join("%d " % (18 if frozenset((i, j)) in nvlink else 0) for i in range(n) for j in range(n))
        out.append('  <distances2 type="OSDev" nbobjs="%d" kind="10" name="NVLinkBandwidth" indexing="gp">' % n)
        out.append('    <indexes length="%d">%s</indexes>' % (len(idx), idx))
        out.append('    <u64values length="%d">%s</u64values>' % (len(vals), vals))
        out.append('  </distances2>')
    out.append('</topology>')
    return "\n".join(out) + "\n"

def all_pairs(ids):
    return {frozenset((i, j)) for i in ids for j in ids if i != j}

files = {
    # CPU-only node: one socket, 16 cores, one NIC.
    "cpu-only.xml": machine(1, 16, 64, [], [0], set()),
    # 4 H200 on two sockets, every pair joined by NVLink, one NIC per socket.
    "4gpu-nvlink.xml": machine(2, 16, 256, [0, 0, 1, 1], [0, 1], all_pairs(range(4))),
    # 2 sockets, 8 GPUs in two NVLink islands of four (no NVLink between islands),
    # 4 NICs, two per socket.
    "8gpu-2socket-4nic.xml": machine(2, 24, 512, [0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1],
                                     all_pairs(range(4)) | all_pairs(range(4, 8))),
}
for name, text in files.items():
    with open(name, "w") as f:
        f.write(text)
    print("wrote", name)
