# shellcheck shell=bash
# shellcheck disable=SC2034  # EI_* variables are set here for the scripts that source lib.sh
# probes.sh: read-only facts about the target, read under the root so that they work on an offline
# image too: os-release, the device-tree model, USB and PCI ids, the CPU model, the L4T release, and
# the accelerators they reveal.

# ei_os_release KEY: a value from the target's /etc/os-release (quotes removed).
ei_os_release() {
    local f
    f=$(ei_path /etc/os-release)
    [[ -r "$f" ]] || f=$(ei_path /usr/lib/os-release)
    [[ -r "$f" ]] || return 0
    awk -F= -v k="$1" '$1 == k { v = substr($0, length(k) + 2); gsub(/^"|"$/, "", v); print v; exit }' "$f"
}

# The device-tree model string ("Raspberry Pi 5 Model B Rev 1.0", "NVIDIA Jetson Orin Nano ...").
ei_dt_model() {
    ei_read_line /proc/device-tree/model || ei_read_line /sys/firmware/devicetree/base/model || true
}

# ei_usb_present VID:PID: a USB device with these ids under ROOT/sys/bus/usb/devices.
ei_usb_present() {
    local want=${1,,} d
    for d in "$(ei_path /sys/bus/usb/devices)"/*; do
        [[ -r "$d/idVendor" && -r "$d/idProduct" ]] || continue
        [[ "$(tr -d '[:space:]' <"$d/idVendor"):$(tr -d '[:space:]' <"$d/idProduct")" == "$want" ]] && return 0
    done
    return 1
}

# ei_pci_present VENDOR:DEVICE (hex without 0x): a PCI function under ROOT/sys/bus/pci/devices.
ei_pci_present() {
    local want=${1,,} d v p
    for d in "$(ei_path /sys/bus/pci/devices)"/*; do
        [[ -r "$d/vendor" && -r "$d/device" ]] || continue
        v=$(tr -d '[:space:]' <"$d/vendor")
        p=$(tr -d '[:space:]' <"$d/device")
        [[ "${v#0x}:${p#0x}" == "$want" ]] && return 0
    done
    return 1
}

ei_cpu_model() {
    local f
    f=$(ei_path /proc/cpuinfo)
    [[ -r "$f" ]] || return 0
    awk -F': *' '/^model name/ { print $2; exit }' "$f"
}

# Jetson: L4T release from /etc/nv_tegra_release ("# R36 (release), REVISION: 3.0, ...").
# Sets EI_L4T_MAJOR (36), EI_L4T_REVISION (3.0) and EI_L4T ("36.3.0"); returns 1 when absent.
ei_l4t_release() {
    local line
    line=$(ei_read_line /etc/nv_tegra_release) || return 1
    if [[ "$line" =~ ^#[[:space:]]*R([0-9]+)[[:space:]]*\(release\),[[:space:]]*REVISION:[[:space:]]*([0-9.]+) ]]; then
        EI_L4T_MAJOR=${BASH_REMATCH[1]}
        EI_L4T_REVISION=${BASH_REMATCH[2]}
        EI_L4T="$EI_L4T_MAJOR.$EI_L4T_REVISION"
        return 0
    fi
    ei_warn "cannot parse $(ei_path /etc/nv_tegra_release): $line"
    return 1
}

# Accelerator facts, from the root (sysfs ids, device nodes, cpuinfo).
EI_CORAL_USB_IDS="1a6e:089a 18d1:9302"   # before / after libedgetpu loads its firmware
EI_CORAL_PCI_IDS="1ac1:089a"
EI_NCS2_USB_IDS="03e7:2485 03e7:f63b"    # Myriad X before / after boot
EI_NCS1_USB_IDS="03e7:2150"
EI_NPU_PCI_IDS="8086:7d1d 8086:ad1d 8086:643e 8086:b03e"   # Meteor, Arrow, Lunar, Panther Lake

_ei_any_usb() { local id; for id in $1; do ei_usb_present "$id" && return 0; done; return 1; }
_ei_any_pci() { local id; for id in $1; do ei_pci_present "$id" && return 0; done; return 1; }

ei_has_coral_usb() { _ei_any_usb "$EI_CORAL_USB_IDS"; }
ei_has_coral_pcie() { _ei_any_pci "$EI_CORAL_PCI_IDS" || ei_exists /dev/apex_0; }
ei_has_ncs2() { _ei_any_usb "$EI_NCS2_USB_IDS"; }
ei_has_ncs1() { _ei_any_usb "$EI_NCS1_USB_IDS"; }
ei_has_npu() { ei_exists /dev/accel/accel0 || _ei_any_pci "$EI_NPU_PCI_IDS"; }
ei_cpu_has_npu() { [[ "$(ei_cpu_model)" == *"Core(TM) Ultra"* ]]; }
ei_is_pi() {
    [[ "$(ei_dt_model)" == "Raspberry Pi"* ]] || ei_exists /etc/rpi-issue
}
